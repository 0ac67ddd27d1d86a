"""Reading files that come from outside the program: image decoding (`images`), and checkpoint
containers (`npz`, `safetensors`) with every header checked before any data, and the array checks
they share (`arrays`)."""
