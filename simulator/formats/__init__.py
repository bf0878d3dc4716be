"""File formats of other tools that infersim writes (and reads): shared key names."""
