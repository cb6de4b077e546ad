"""What a finished ``--model llava`` run leaves for a person, besides the loss curve: whether the model reads the
images, and its answers about a few held-out images.

- ``<log-dir>/image_eval.json``: the held-out answer loss with the real images and with every image blanked
  (same model, same samples; a blank image is all zeros after normalization), and their difference. A model
  that learned to use the images has ``val_loss`` clearly below ``val_loss_blank_images``.
- ``<log-dir>/samples.txt``: for ``--num-samples`` held-out samples, the question, the reference answer and the
  model's greedy answer. Decoding runs the whole LLaVAModel (encoder included) once per new token, no KV cache.
  With pipeline parallelism the decode loop would have to pass activations between stages: the file then says
  that samples need ``--pipeline-model-parallel-size 1`` (it is not silently missing).
The values read are the run's ``Schedule`` (training/section.py) and tasks/section.py's ``VisionOutputs``; the
held-out set is read by the task's ``VisionReader``.
May assume: called on every rank after the last iteration (evaluation and decoding are collective); rank 0 writes.
"""

from __future__ import annotations

import json
import os

import torch
from megatron.core import parallel_state
from megatron.core.utils import get_attr_wrapped_model

from mtmegatron.data.vision.template import Turn, render
from mtmegatron.backends.device import compute_device
from mtmegatron.tasks.llava.data import Split, VisionReader
from mtmegatron.tasks.llava.step import llava_step
from mtmegatron.tasks.section import VisionOutputs
from mtmegatron.training.evaluate import validation_loss
from mtmegatron.training.section import Schedule
from mtmegatron.utils.metrics import print_rank0


def image_eval(model, valid, schedule: Schedule, reader: VisionReader) -> dict:
    """Held-out loss with and without the images (``valid`` is a ``multimodal_data.Split``)."""
    step = llava_step(reader)
    with_images = validation_loss(valid, model, schedule, step)
    blank = validation_loss(valid.blanked(), model, schedule, step)
    return {"val_loss": with_images, "val_loss_blank_images": blank, "margin": blank - with_images,
            "eval_iters": schedule.eval_iters, "global_batch_size": schedule.global_batch_size}


def _conversation(dataset, index: int):
    """(sample id, turns, image paths, image folder, loader dataset) of sample ``index`` of a loader dataset or
    a Subset of one."""
    if isinstance(dataset, torch.utils.data.Subset):
        return _conversation(dataset.dataset, dataset.indices[index])
    sample_id, turns, image_paths = dataset.conversation(index)
    return sample_id, turns, image_paths, dataset.image_folder, dataset


def _prompt(template: str, question: Turn, tokenizer) -> list[int]:
    """Token ids of the conversation up to where the assistant's first answer starts."""
    ids, trained = render(template, [question, Turn("assistant", "x")], tokenizer)
    return ids[:trained.index(True)]


def greedy_answer(chunk, tokenizer, ids: list[int], images: torch.Tensor, num_tiles: list[int],
                  outputs: VisionOutputs, max_tokens: int, stop_ids: set[int]) -> list[int]:
    """Greedy continuation of ``ids`` (with one -200 per image) through the LLaVAModel ``chunk``."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    img_seq_len = get_attr_wrapped_model(chunk, "img_seq_len")
    device = compute_device()
    images = images.to(device)
    tiles = torch.tensor(num_tiles, dtype=torch.int32, device=device)
    generated: list[int] = []
    with torch.no_grad():
        for _ in range(max_tokens):
            text = ids + generated
            combined = len(text) - len(num_tiles) + sum(num_tiles) * img_seq_len
            if combined > outputs.decoder_seq_length:
                break
            pad = (-combined % tp) if outputs.sequence_parallel else 0  # causal: padding after the end changes nothing
            tokens = torch.tensor([text + [tokenizer.eod] * pad], dtype=torch.long, device=device)
            positions = torch.arange(tokens.shape[1], dtype=torch.long, device=device).unsqueeze(0)
            logits, _ = chunk(images, tokens, positions, None, num_image_tiles=tiles, runtime_gather_output=True)
            next_id = int(logits[0, combined - 1].float().argmax())
            if next_id in stop_ids:
                break
            generated.append(next_id)
    return generated


def _stop_ids(tokenizer) -> set[int]:
    stops = {tokenizer.eod}
    for name in ("<|eot_id|>", "</s>"):
        token_id = tokenizer.tokenizer.token_to_id(name)
        if token_id is not None:
            stops.add(token_id)
    return stops


def answer_samples(model, data, outputs: VisionOutputs) -> list[str]:
    """One text block per held-out sample: image, question, reference answer, model answer."""
    from mtmegatron.data.vision.images import ImageConfig

    source = data.valid if data.valid is not None else data.train
    template = data.info["template"]
    blocks = []
    chunk = model[0]
    chunk.eval()
    try:
        for i in range(min(outputs.num_samples, len(source))):
            sample_id, turns, image_paths, folder, dataset = _conversation(source, i)
            turns = [t for t in turns if t.role != "system"]
            question, reference = turns[0], turns[1].content.strip() if len(turns) > 1 else ""
            if question.content.count("<image>") != len(image_paths):  # the plain template reads no text
                question = Turn("user", "<image>\n" * len(image_paths) + question.content)
            cfg: ImageConfig = dataset.config.image
            loaded = [cfg.load(p) for p in image_paths]
            images = torch.cat(loaded) if loaded else torch.zeros((0, 3, cfg.img_h, cfg.img_w))
            ids = _prompt(template, question, data.tokenizer)
            answer = greedy_answer(chunk, data.tokenizer, ids, images, [len(t) for t in loaded], outputs,
                                   outputs.sample_tokens, _stop_ids(data.tokenizer))
            shown = question.content.replace("<image>\n", "").replace("<image>", "").strip()
            blocks.append(f"--- sample {sample_id!r} ({', '.join(os.path.relpath(p, folder) for p in image_paths)})\n"
                          f"question:  {shown}\nreference: {reference}\nmodel:     "
                          f"{data.tokenizer.detokenize(answer).strip()}\n")
    finally:
        chunk.train()
    return blocks


def write_multimodal_outputs(model, data, outputs: VisionOutputs, schedule: Schedule, reader: VisionReader,
                             sample: bool = True) -> None:
    rank = torch.distributed.get_rank()
    if data.valid is not None and schedule.eval_iters > 0:
        result = image_eval(model, Split(data.valid, data.collate, shuffle=False), schedule, reader)
        if rank == 0:
            with open(os.path.join(outputs.log_dir, "image_eval.json"), "w") as f:
                json.dump(result, f, indent=1)
        print_rank0(rank, f"mtmegatron: held-out answer loss {result['val_loss']:.4f} with images, "
                    f"{result['val_loss_blank_images']:.4f} with blank images (margin {result['margin']:.4f})")
    if not sample or outputs.num_samples == 0:
        return
    if (len(model) != 1 or parallel_state.get_pipeline_model_parallel_world_size() > 1):
        text = ("no samples: greedy decoding through LLaVAModel is only implemented with "
                "--pipeline-model-parallel-size 1 (the decode loop does not pass activations between stages); "
                "rerun the checkpoint with PP 1 (--load DIR --finetune --train-iters 0) to see answers\n")
    else:
        text = "".join(answer_samples(model, data, outputs))
    if rank == 0:
        with open(os.path.join(outputs.log_dir, "samples.txt"), "w") as f:
            f.write(text)
    print_rank0(rank, f"mtmegatron: held-out answers (greedy, up to {outputs.sample_tokens} tokens):\n{text.rstrip()}")
