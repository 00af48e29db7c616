from areal.api.io_struct import ModelRequest, ModelResponse, WeightUpdateMeta

__all__ = ["ModelRequest", "ModelResponse", "WeightUpdateMeta"]
