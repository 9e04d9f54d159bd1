"""Preprocessing defaults shared by the registry and the transforms (timm's values, as in
``timm.data.constants``)."""

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)
DEFAULT_CROP_PCT = 0.875
