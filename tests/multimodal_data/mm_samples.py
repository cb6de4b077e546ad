"""Writers for the multimodal data tests: PNG images, JSONL files and LLaVA question/answer records."""

from __future__ import annotations

import json
import os

import numpy as np
from PIL import Image


def write_png(path, width: int, height: int, colour=(200, 30, 30)) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.full((height, width, 3), colour, dtype=np.uint8)).save(path)
    return path


def write_jsonl(path, records) -> str:
    with open(path, "w") as f:
        for record in records:
            f.write(record if isinstance(record, str) else json.dumps(record))
            f.write("\n")
    return str(path)


def qa(image=None, question="<image>\nWhat colour is the shape?", answer="red", sample_id="s"):
    record = {"id": sample_id, "conversations": [{"from": "human", "value": question},
                                                 {"from": "gpt", "value": answer}]}
    if image is not None:
        record["image"] = image
    return record
