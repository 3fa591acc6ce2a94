"""The Faster R-CNN settings the ported layers read, as ``cfg.TRAIN.X`` / ``cfg.TEST.X``.

Values are py-faster-rcnn's defaults (the ones its published models were trained and tested with);
change them before building a net, e.g. ``cfg.TEST.RPN_POST_NMS_TOP_N = 100``.
"""

from __future__ import annotations

import numpy as np


class Options(dict):
    """A dict whose keys are also attributes."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value


cfg = Options(
    PIXEL_MEANS=np.array([[[102.9801, 115.9465, 122.7717]]]),  # BGR
    RNG_SEED=3,
    USE_GPU_NMS=True,  # used when pycaffe_lite runs in GPU mode
    TRAIN=Options(
        SCALES=(600,), MAX_SIZE=1000, IMS_PER_BATCH=1, USE_FLIPPED=True,
        BATCH_SIZE=128, FG_FRACTION=0.25, FG_THRESH=0.5, BG_THRESH_HI=0.5, BG_THRESH_LO=0.1,
        BBOX_NORMALIZE_TARGETS_PRECOMPUTED=True, BBOX_NORMALIZE_MEANS=(0.0, 0.0, 0.0, 0.0),
        BBOX_NORMALIZE_STDS=(0.1, 0.1, 0.2, 0.2), BBOX_INSIDE_WEIGHTS=(1.0, 1.0, 1.0, 1.0),
        RPN_POSITIVE_OVERLAP=0.7, RPN_NEGATIVE_OVERLAP=0.3, RPN_CLOBBER_POSITIVES=False,
        RPN_FG_FRACTION=0.5, RPN_BATCHSIZE=256, RPN_NMS_THRESH=0.7, RPN_PRE_NMS_TOP_N=12000,
        RPN_POST_NMS_TOP_N=2000, RPN_MIN_SIZE=16, RPN_BBOX_INSIDE_WEIGHTS=(1.0, 1.0, 1.0, 1.0),
        RPN_POSITIVE_WEIGHT=-1.0,
    ),
    TEST=Options(
        SCALES=(600,), MAX_SIZE=1000, NMS=0.3, RPN_NMS_THRESH=0.7, RPN_PRE_NMS_TOP_N=6000,
        RPN_POST_NMS_TOP_N=300, RPN_MIN_SIZE=16,
    ),
)


def parse_param_str(text: str) -> dict:
    """python_param.param_str as py-faster-rcnn writes it (YAML such as ``'feat_stride': 16`` or
    ``{'num_classes': 21}``): a flat mapping of numbers and strings, read without PyYAML."""
    import ast

    text = (text or "").strip()
    if not text:
        return {}
    if not text.startswith("{"):
        text = "{" + text + "}"
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"param_str {text!r}: expected a mapping such as \"'feat_stride': 16\"") from exc
    if not isinstance(value, dict):
        raise ValueError(f"param_str {text!r}: expected a mapping")
    return value
