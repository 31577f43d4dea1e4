"""Int8 copies of a model for fast CPU prediction: OpenVINO, ONNX Runtime, and the fp32 fallback for close calls."""
