"""LiteRT flatbuffers: the builder, the conversion of one Edge partition, converters' helpers,
and the delegate payload that carries the NPU compiler's output."""
