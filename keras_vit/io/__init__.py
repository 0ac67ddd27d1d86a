"""Reading files that come from outside the program: image decoding (`images`), and `.npz`,
`.safetensors` and Keras `.weights.h5` checkpoints with every header checked before any data
(`npz`, `safetensors`, `h5`, `arrays`)."""
