"""Writes connectors/tests/fixtures/minilm-reference.json: all-MiniLM-L6-v2 vectors of a few texts computed by the
reference implementation, sentence-transformers (run once in a throwaway virtual environment:
`python3 -m venv /tmp/st && /tmp/st/bin/pip install sentence-transformers`, then
`/tmp/st/bin/python scripts/make_minilm_fixture.py .models/all-MiniLM-L6-v2`)."""
import json
import sys

import sentence_transformers
from sentence_transformers import SentenceTransformer

model_dir = sys.argv[1]
texts = [
    "The council approved the sea wall at a cost of 41 million euros.",
    "Caroline went to the LGBTQ support group on 7 May 2023.",
    "hi",
    "Melanie: I painted a lake sunrise last year! It was so peaceful.",
    "Naïve café owners in Zürich — «ça va?» — 東京 and emoji 🎉 are tokenised too.",
    "   leading and trailing spaces   ",
    "The quarterly budget review covered infrastructure, staffing, and the delayed procurement of new servers. " * 30,
    "A",
]
model = SentenceTransformer(model_dir, device="cpu")
vecs = model.encode(texts, normalize_embeddings=False, convert_to_numpy=True)
out = {
    "model": "all-MiniLM-L6-v2",
    "reference": f"sentence-transformers {sentence_transformers.__version__}, max_seq_length {model.max_seq_length}",
    "items": [{"text": t, "vector": [round(float(x), 7) for x in v]} for t, v in zip(texts, vecs)],
}
with open("connectors/tests/fixtures/minilm-reference.json", "w") as f:
    json.dump(out, f)
print(out["reference"], len(out["items"]), "items, dim", len(vecs[0]))
