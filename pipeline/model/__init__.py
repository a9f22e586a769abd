"""The sentence encoder and model folders (load, save, pack, encode)."""
