"""Reading files that come from outside the program: image decoding (`images`), and `.npz` and
`.safetensors` checkpoints with every header checked before any data (`npz`, `safetensors`, `arrays`)."""
