"""What travels between processes: the envelope and its codec, every broker and Redis name, the
session record a worker is handed, and the edge's turn fence."""
