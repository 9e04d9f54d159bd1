"""attn_core.torchscript: TorchScript archives are read as tensors and their code never runs.

``torch.jit.load`` is used here only as the reference, on archives these tests built from
benign modules (and, on purpose, on the payload fixture to prove that it is live).
"""

from __future__ import annotations

import gc
import importlib
import pickle
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import open_clip
import pytest
import torch
from attn_core.hub import CheckpointError, UnsafeCheckpointError
from attn_core.torchscript import is_torchscript_archive, read_torchscript_archive
from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg, convert_weights_to_lp
from torch import nn

payloads = importlib.import_module("attn_zoo_test_payloads")  # registered by tests/conftest.py


def _jit(fn: Callable[[], object]) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.* FutureWarnings, TracerWarnings
        return fn()


def _save(module: nn.Module | torch.jit.ScriptModule, path: Path) -> Path:
    _jit(lambda: torch.jit.save(module, str(path)))
    return path


def _reference(path: Path) -> dict[str, torch.Tensor]:
    return dict(_jit(lambda: torch.jit.load(str(path), map_location="cpu")).state_dict())


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _assert_same(ours: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor]) -> None:
    """Key for key (in order), dtype, shape, stride and bytes."""
    assert list(ours) == list(ref)
    for name, want in ref.items():
        got = ours[name]
        assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride()), name
        assert torch.equal(_raw(got), _raw(want)), name
        assert got.device.type == "cpu" and not got.requires_grad, name


def _rewrite(src: Path, dst: Path, edit: Callable[[str, bytes], bytes | None]) -> Path:
    """Copy a zip entry by entry; ``edit(name, data)`` returns new bytes or None to drop it."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            data = edit(name, zin.read(name))
            if data is not None:
                zout.writestr(name, data)
    return dst


def _zip(path: Path, data_pkl: bytes) -> Path:
    """A minimal archive shaped like ``torch.jit.save``'s around a hand-written data.pkl."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("evil/data.pkl", data_pkl)
        zf.writestr("evil/constants.pkl", pickle.dumps((), protocol=2))
        zf.writestr("evil/code/__torch__.py", "")
        zf.writestr("evil/version", "3\n")
    return path


# -- parity with torch.jit.load -------------------------------------------------------------


def _openai_style_clip(vision: str) -> tuple[nn.Module, int, int]:
    """A tiny random open_clip CLIP laid out like OpenAI's released archives.

    QuickGELU; ``attn_mask`` a plain attribute (a traced constant, not a state-dict key);
    ``input_resolution`` / ``context_length`` / ``vocab_size`` int64 buffers; conv / linear /
    attention / projection weights in fp16, the rest fp32 (OpenAI's ``convert_weights``).
    Widths are 64 so that open_clip's ``build_model_from_openai_state_dict`` (heads = width /
    64) can rebuild it.
    """
    if vision == "vit":
        vision_cfg = CLIPVisionCfg(layers=1, width=64, patch_size=8, image_size=16)
        image_size = 16
    else:  # ModifiedResNet, as RN50: BatchNorm buffers, attention pooling
        vision_cfg = CLIPVisionCfg(layers=(1, 1, 1, 1), width=8, image_size=32)
        image_size = 32
    text_cfg = CLIPTextCfg(context_length=8, vocab_size=50, width=64, heads=1, layers=1)
    model = CLIP(embed_dim=16, vision_cfg=vision_cfg, text_cfg=text_cfg, quick_gelu=True)
    model.attn_mask = model._buffers.pop("attn_mask")
    for name, value in [
        ("input_resolution", image_size),
        ("context_length", 8),
        ("vocab_size", 50),
    ]:
        model.__dict__.pop(name, None)
        model.register_buffer(name, torch.tensor(value))
    with torch.no_grad():
        for p in model.parameters():  # random, but not init-pattern (ones / zeros) values
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval(), image_size, 8


@pytest.mark.parametrize("vision", ["vit", "resnet"])
def test_parity_traced_openai_style_clip(tmp_path: Path, vision: str) -> None:
    model, image_size, context_length = _openai_style_clip(vision)
    inputs = (torch.randn(1, 3, image_size, image_size), torch.randint(0, 50, (1, context_length)))
    traced = _jit(lambda: torch.jit.trace(model, inputs, check_trace=False))
    convert_weights_to_lp(model)  # the traced module shares these tensors -> fp16 in the archive
    path = _save(traced, tmp_path / f"{vision}.pt")

    assert is_torchscript_archive(path)
    ours, ref = read_torchscript_archive(path), _reference(path)
    _assert_same(ours, ref)
    _assert_same(ours, model.state_dict())

    assert ours["logit_scale"].dtype == torch.float32
    assert ours["transformer.resblocks.0.attn.in_proj_weight"].dtype == torch.float16
    assert ours["input_resolution"].item() == image_size and "attn_mask" not in ours
    first = "visual.conv1.weight" if vision == "vit" else "visual.bn1.running_var"
    assert first in ours
    # open_clip rebuilds its model from the dict, as it does from torch.jit.load's.
    rebuilt = open_clip.model.build_model_from_openai_state_dict(dict(ours)).state_dict()
    assert set(rebuilt) == set(ours) - {"input_resolution", "context_length", "vocab_size"}
    for name, value in rebuilt.items():
        assert value.dtype == ours[name].dtype and torch.equal(value, ours[name]), name


class _Holder:
    """A TorchScript class attribute: its tensor is not part of the state dict."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4, bias=False)  # a None parameter
        self.norm = nn.BatchNorm1d(4)  # int64 num_batches_tracked buffer
        self.register_buffer("scale", torch.tensor(2.5))  # 0-dim
        self.register_buffer("cache", torch.arange(3.0), persistent=False)  # jit keeps it
        self.plain = torch.full((2,), 7.0)  # a tensor attribute, not a buffer: not in state dict
        self.sizes: list[int] = [1, 2]
        self.holder = _Holder(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.lin(x)) * self.scale + self.cache.sum() + self.plain.sum()
        return y + self.holder.x.sum() + self.sizes[0]


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 3)
        self.blocks = nn.ModuleList([_Inner(), _Inner()])
        self.head = nn.Linear(4, 2).to(torch.bfloat16)
        self.gate = nn.Parameter(torch.randn(()))
        self.register_buffer("flags", torch.tensor([True, False, True]))
        self.register_buffer("spectrum", torch.randn(3, dtype=torch.complex64))
        self.register_buffer("fp8", torch.randn(4).to(torch.float8_e4m3fn))
        self.register_buffer("empty", torch.empty(0, 5))
        self.register_buffer("row", self.emb.weight.data[2])  # a view: shares emb's storage
        self.register_buffer("strided", torch.randn(4, 6)[:, ::2])  # non-contiguous

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for block in self.blocks:
            x = block(x)[..., :3]
        return self.head(x.to(torch.bfloat16)).float() * self.gate + self.row.sum()


def test_parity_scripted_nested_module(tmp_path: Path) -> None:
    module = _Outer().eval()
    path = _save(_jit(lambda: torch.jit.script(module)), tmp_path / "outer.pt")
    ours, ref = read_torchscript_archive(path), _reference(path)
    _assert_same(ours, ref)
    assert "blocks.0.cache" in ours and "blocks.0.plain" not in ours
    assert "blocks.1.lin.bias" not in ours and "blocks.1.holder.x" not in ours
    assert ours["blocks.1.norm.num_batches_tracked"].dtype == torch.int64
    # views keep sharing memory, as in the module that was saved
    assert (
        ours["row"].untyped_storage().data_ptr() == ours["emb.weight"].untyped_storage().data_ptr()
    )
    assert ours["strided"].stride() == (6, 2)


def test_tensors_own_their_memory(tmp_path: Path) -> None:
    module = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    expected = {k: v.clone() for k, v in module.state_dict().items()}
    path = _save(_jit(lambda: torch.jit.script(module)), tmp_path / "seq.pt")
    ours = read_torchscript_archive(path)
    path.unlink()
    gc.collect()
    _assert_same(ours, expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # writable: no "non-writable buffer" warning, no error
        ours["0.weight"].add_(1.0)
    assert torch.equal(ours["0.weight"], expected["0.weight"] + 1.0)


def test_big_endian_archive_is_byteswapped(tmp_path: Path) -> None:
    module = nn.Linear(3, 2)  # float32 only: every storage swaps in 4-byte units
    path = _save(_jit(lambda: torch.jit.script(module)), tmp_path / "lin.pt")

    def to_big(name: str, data: bytes) -> bytes:
        if name.endswith("/byteorder"):
            return b"big"
        if "/data/" in name:
            return (
                torch.frombuffer(bytearray(data), dtype=torch.uint8)
                .view(-1, 4)
                .flip(-1)
                .numpy()
                .tobytes()
            )
        return data

    big = _rewrite(path, tmp_path / "big.pt", to_big)
    _assert_same(read_torchscript_archive(big), _reference(path))


# -- hostile archives -----------------------------------------------------------------------


def test_payload_fixture_is_live(torchscript_payload: tuple[Path, Path]) -> None:
    archive, marker = torchscript_payload
    assert is_torchscript_archive(archive) and not marker.exists()
    _jit(lambda: torch.jit.load(str(archive)))  # the unsafe way: its __setstate__ runs
    assert marker.exists()


def test_payload_is_refused_and_never_runs(torchscript_payload: tuple[Path, Path]) -> None:
    archive, marker = torchscript_payload
    with pytest.raises(UnsafeCheckpointError, match="__setstate__") as info:
        read_torchscript_archive(archive)
    assert archive.name in str(info.value) and "weights_only" not in str(info.value)
    assert isinstance(info.value, ValueError)
    assert not marker.exists()


def test_payload_in_an_attribute_is_skipped_and_never_runs(tmp_path: Path) -> None:
    archive, marker = tmp_path / "host.pt", tmp_path / "host.marker"
    payloads.make_torchscript_payload(archive, marker, in_attribute=True)
    ours = read_torchscript_archive(archive)
    assert list(ours) == ["proj.weight", "proj.bias"] and not marker.exists()
    _assert_same(ours, _reference(archive))  # the reference load fires it, as it would
    assert marker.exists()


def _global_call(module: str, name: str, arg: str) -> bytes:
    """Protocol-0 pickle of ``module.name(arg)``: GLOBAL, MARK, UNICODE, TUPLE, REDUCE."""
    return f"c{module}\n{name}\n(V{arg}\ntR.".encode()


@pytest.mark.parametrize(
    ("module", "name", "kind"),
    [
        ("os", "system", "shell"),
        ("posix", "system", "shell"),
        ("subprocess", "getoutput", "shell"),
        ("builtins", "eval", "python"),
        ("builtins", "exec", "python"),
        ("__builtin__", "eval", "python"),
        ("torch", "load", "path"),
    ],
)
def test_refuses_hand_crafted_globals(tmp_path: Path, module: str, name: str, kind: str) -> None:
    marker = tmp_path / "ran.marker"
    arg = {
        "shell": f"touch {marker}",
        "python": f"open({str(marker)!r}, 'w').close()",
        "path": str(marker),
    }[kind]
    path = _zip(tmp_path / "ViT.pt", _global_call(module, name, arg))
    assert is_torchscript_archive(path)
    with pytest.raises(UnsafeCheckpointError) as info:
        read_torchscript_archive(path)
    message = str(info.value)
    assert f"refusing global '{module}.{name}' in ViT.pt" in message
    assert "tensors only" in message and "weights_only" not in message
    assert not marker.exists()


def test_hand_crafted_pickle_is_live(tmp_path: Path) -> None:
    """The refused pickles above are real payloads: plain ``pickle.loads`` runs them."""
    marker = tmp_path / "ran.marker"
    pickle.loads(_global_call("builtins", "eval", f"open({str(marker)!r}, 'w').close()"))
    assert marker.exists()


def test_refuses_jit_load_reference(tmp_path: Path, torchscript_payload: tuple[Path, Path]) -> None:
    """A data.pkl calling ``torch.jit.load`` on the payload (STACK_GLOBAL, protocol 4)."""
    archive, marker = torchscript_payload

    class Call:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return torch.jit.load, (str(archive),)

    path = _zip(tmp_path / "RN50.pt", pickle.dumps(Call(), protocol=4))
    with pytest.raises(UnsafeCheckpointError, match=r"refusing global 'torch\.jit\._serial"):
        read_torchscript_archive(path)
    assert not marker.exists()


def test_refuses_foreign_persistent_ids(tmp_path: Path) -> None:
    path = _zip(tmp_path / "pid.pt", b"\x80\x02X\x04\x00\x00\x00evilQ.")  # BINPERSID 'evil'
    with pytest.raises(UnsafeCheckpointError, match="refusing persistent id 'evil' in pid.pt"):
        read_torchscript_archive(path)


# -- not an archive, broken archives ---------------------------------------------------------


def test_not_an_archive(tmp_path: Path) -> None:
    text = tmp_path / "notes.pt"
    text.write_text("not a zip")
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(2)}, plain)  # a torch.save zip: data.pkl but no code/
    bare = tmp_path / "bare.zip"
    with zipfile.ZipFile(bare, "w") as zf:
        zf.writestr("x/readme.txt", "hi")
    for path in (text, plain, bare, tmp_path / "missing.pt"):
        assert not is_torchscript_archive(path)
        with pytest.raises(CheckpointError, match=path.name):
            read_torchscript_archive(path)


@pytest.fixture
def small_archive(tmp_path: Path) -> Path:
    return _save(_jit(lambda: torch.jit.script(nn.Linear(3, 2))), tmp_path / "small.pt")


def test_missing_storage(tmp_path: Path, small_archive: Path) -> None:
    broken = _rewrite(
        small_archive, tmp_path / "broken.pt", lambda n, d: None if n.endswith("/data/0") else d
    )
    with pytest.raises(CheckpointError, match=r"missing storage 'small/data/0' in .*broken\.pt"):
        read_torchscript_archive(broken)


def test_storage_of_wrong_size(tmp_path: Path, small_archive: Path) -> None:
    broken = _rewrite(
        small_archive, tmp_path / "short.pt", lambda n, d: d[:-1] if n.endswith("/data/0") else d
    )
    with pytest.raises(CheckpointError, match="expected"):
        read_torchscript_archive(broken)


def test_truncated_data_pkl(tmp_path: Path, small_archive: Path) -> None:
    broken = _rewrite(
        small_archive, tmp_path / "cut.pt", lambda n, d: d[:40] if n.endswith("data.pkl") else d
    )
    with pytest.raises(CheckpointError, match=r"cannot read small/data\.pkl"):
        read_torchscript_archive(broken)


def test_class_without_parameter_list(tmp_path: Path, small_archive: Path) -> None:
    def strip(name: str, data: bytes) -> bytes:
        if name.endswith(".py"):
            return b"\n".join(line for line in data.split(b"\n") if b"__parameters__" not in line)
        return data

    broken = _rewrite(small_archive, tmp_path / "undeclared.pt", strip)
    with pytest.raises(CheckpointError, match="declares no __parameters__"):
        read_torchscript_archive(broken)
