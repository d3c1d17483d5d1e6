//! Quantized weights: block formats, activation quantization and matmuls that read stored blocks in place.
