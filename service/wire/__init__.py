"""Wire formats: generated protobuf code and proto <-> contract converters."""
