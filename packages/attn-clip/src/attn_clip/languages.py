"""Language codes for multilingual CLIPs: NLLB's source languages and the ISO 639-1 codes
people type, and the tokenizer set to a language.

NLLB text towers (``nllb-clip-*``) read each text after a source-language token, a FLORES-200
code such as ``zho_Hans`` or ``deu_Latn`` (:data:`NLLB_LANGUAGES`, the 202 codes of NLLB-200's
tokenizer, in its order). :func:`language_code` also takes the two-letter ISO 639-1 codes of
:data:`ISO_639_1` (``zh`` -> ``zho_Hans``, ``de`` -> ``deu_Latn``, ...). XLM-R, RoBERTa and
mT5 tokenizers (and OpenAI's BPE) have no language token: for them a language changes only
what the apps do around the model, e.g. the prompt templates
(:func:`attn_clip.zero_shot.templates_for_language`).
"""

from __future__ import annotations

import re
from typing import Any

from attn_core.errors import InputError

__all__ = [
    "ENGLISH",
    "ISO_639_1",
    "NLLB_LANGUAGES",
    "has_source_languages",
    "is_english",
    "language_code",
    "tokenizer_for_language",
]

# NLLB-200's language codes (transformers' FAIRSEQ_LANGUAGE_CODES, the order of their ids)
NLLB_LANGUAGES: tuple[str, ...] = tuple(
    """
    ace_Arab ace_Latn acm_Arab acq_Arab aeb_Arab afr_Latn ajp_Arab aka_Latn amh_Ethi apc_Arab
    arb_Arab ars_Arab ary_Arab arz_Arab asm_Beng ast_Latn awa_Deva ayr_Latn azb_Arab azj_Latn
    bak_Cyrl bam_Latn ban_Latn bel_Cyrl bem_Latn ben_Beng bho_Deva bjn_Arab bjn_Latn bod_Tibt
    bos_Latn bug_Latn bul_Cyrl cat_Latn ceb_Latn ces_Latn cjk_Latn ckb_Arab crh_Latn cym_Latn
    dan_Latn deu_Latn dik_Latn dyu_Latn dzo_Tibt ell_Grek eng_Latn epo_Latn est_Latn eus_Latn
    ewe_Latn fao_Latn pes_Arab fij_Latn fin_Latn fon_Latn fra_Latn fur_Latn fuv_Latn gla_Latn
    gle_Latn glg_Latn grn_Latn guj_Gujr hat_Latn hau_Latn heb_Hebr hin_Deva hne_Deva hrv_Latn
    hun_Latn hye_Armn ibo_Latn ilo_Latn ind_Latn isl_Latn ita_Latn jav_Latn jpn_Jpan kab_Latn
    kac_Latn kam_Latn kan_Knda kas_Arab kas_Deva kat_Geor knc_Arab knc_Latn kaz_Cyrl kbp_Latn
    kea_Latn khm_Khmr kik_Latn kin_Latn kir_Cyrl kmb_Latn kon_Latn kor_Hang kmr_Latn lao_Laoo
    lvs_Latn lij_Latn lim_Latn lin_Latn lit_Latn lmo_Latn ltg_Latn ltz_Latn lua_Latn lug_Latn
    luo_Latn lus_Latn mag_Deva mai_Deva mal_Mlym mar_Deva min_Latn mkd_Cyrl plt_Latn mlt_Latn
    mni_Beng khk_Cyrl mos_Latn mri_Latn zsm_Latn mya_Mymr nld_Latn nno_Latn nob_Latn npi_Deva
    nso_Latn nus_Latn nya_Latn oci_Latn gaz_Latn ory_Orya pag_Latn pan_Guru pap_Latn pol_Latn
    por_Latn prs_Arab pbt_Arab quy_Latn ron_Latn run_Latn rus_Cyrl sag_Latn san_Deva sat_Beng
    scn_Latn shn_Mymr sin_Sinh slk_Latn slv_Latn smo_Latn sna_Latn snd_Arab som_Latn sot_Latn
    spa_Latn als_Latn srd_Latn srp_Cyrl ssw_Latn sun_Latn swe_Latn swh_Latn szl_Latn tam_Taml
    tat_Cyrl tel_Telu tgk_Cyrl tgl_Latn tha_Thai tir_Ethi taq_Latn taq_Tfng tpi_Latn tsn_Latn
    tso_Latn tuk_Latn tum_Latn tur_Latn twi_Latn tzm_Tfng uig_Arab ukr_Cyrl umb_Latn urd_Arab
    uzn_Latn vec_Latn vie_Latn war_Latn wol_Latn xho_Latn ydd_Hebr yor_Latn yue_Hant zho_Hans
    zho_Hant zul_Latn
    """.split()
)
ENGLISH = "eng_Latn"
# ISO 639-1 -> NLLB: the language's most used script, Modern Standard Arabic, Mandarin in
# simplified characters (zho_Hant for traditional), Iranian Persian, Norwegian Bokmål
ISO_639_1: dict[str, str] = {
    "ar": "arb_Arab", "bn": "ben_Beng", "cs": "ces_Latn", "da": "dan_Latn", "de": "deu_Latn",
    "el": "ell_Grek", "en": "eng_Latn", "es": "spa_Latn", "fa": "pes_Arab", "fi": "fin_Latn",
    "fr": "fra_Latn", "he": "heb_Hebr", "hi": "hin_Deva", "hu": "hun_Latn", "id": "ind_Latn",
    "it": "ita_Latn", "ja": "jpn_Jpan", "ko": "kor_Hang", "nl": "nld_Latn", "no": "nob_Latn",
    "pl": "pol_Latn", "pt": "por_Latn", "ro": "ron_Latn", "ru": "rus_Cyrl", "sv": "swe_Latn",
    "sw": "swh_Latn", "ta": "tam_Taml", "th": "tha_Thai", "tr": "tur_Latn", "uk": "ukr_Cyrl",
    "ur": "urd_Arab", "vi": "vie_Latn", "zh": "zho_Hans",
}  # fmt: skip
_NLLB_FORM = re.compile(r"([a-z]{3})_([a-z]{4})", re.IGNORECASE)


def language_code(language: str) -> str:
    """The NLLB code of ``language``: an NLLB code (``"zho_Hans"``; any case) or an ISO
    639-1 code of :data:`ISO_639_1` (``"zh"``, ``"DE"``). Anything else is an
    :class:`~attn_core.errors.InputError` (a ``ValueError``) saying what is accepted."""
    if not isinstance(language, str):
        raise InputError(f"language must be a language code string, got {language!r}")
    code = language.strip()
    if code.lower() in ISO_639_1:
        return ISO_639_1[code.lower()]
    m = _NLLB_FORM.fullmatch(code)
    if m and f"{m.group(1).lower()}_{m.group(2).title()}" in NLLB_LANGUAGES:
        return f"{m.group(1).lower()}_{m.group(2).title()}"
    raise InputError(
        f"unknown language {language!r}: expected an NLLB code (one of its "
        f"{len(NLLB_LANGUAGES)}, e.g. zho_Hans, deu_Latn, fra_Latn) or an ISO 639-1 code "
        f"({', '.join(ISO_639_1)})"
    )


def is_english(language: str | None) -> bool:
    """Whether ``language`` (None: the default) is English (``en`` / ``eng_Latn``)."""
    return language is None or language_code(language) == ENGLISH


def has_source_languages(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` starts each text with a source-language token (NLLB's): an
    :class:`~attn_clip.HFTokenizer` whose ``language`` is set."""
    from .tokenizer import HFTokenizer

    return isinstance(tokenizer, HFTokenizer) and tokenizer.language is not None


def tokenizer_for_language(tokenizer: Any, language: str) -> tuple[Any, str | None]:
    """``(tokenizer, note)``: for a tokenizer with source languages (NLLB) a copy that
    reads texts as ``language`` (:func:`language_code`; the ids start with its token) and no
    note; any other tokenizer unchanged, with a one-line note saying that the language does
    not reach it. ``InputError`` for an unknown code or one the tokenizer does not have."""
    code = language_code(language)
    if not has_source_languages(tokenizer):
        what = getattr(tokenizer, "tokenizer_class", None) or "OpenAI's BPE"
        return tokenizer, (
            f"language {language!r}: the tokenizer ({what}) has no source-language tokens, "
            "so its ids do not change"
        )
    if code == tokenizer.language:
        return tokenizer, None
    rebuild, (cls, kwargs) = tokenizer.__reduce__()  # HFTokenizer: its own arguments
    try:
        return rebuild(cls, {**kwargs, "language": code}), None
    except ValueError as e:  # a code this tokenizer lacks
        raise InputError(f"language {language!r}: {e}") from None
