"""Default and allowed settings of ``python -m export`` (opset range, verification images, tolerance)."""

DEFAULT_OPSET = 20
MIN_OPSET = 18  # the dynamo exporter's operators are written for 18; lower needs a fragile down-conversion
MAX_OPSET = 23
DEFAULT_VERIFY_IMAGES = 32
DEFAULT_ATOL = 1e-4
