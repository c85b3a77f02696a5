"""Small, complete programs shipped with flowlab (``flowlab demo`` runs ``digits_mlp``)."""
