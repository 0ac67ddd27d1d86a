"""Reading files that come from outside the program: checkpoint containers (`npz`, `safetensors`)
with every header checked before any data, and the array checks they share (`arrays`)."""
