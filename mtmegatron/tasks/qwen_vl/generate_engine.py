"""Generation with images on megatron-core's static inference engine (inference/engine.py:
``StaticInferenceEngine``, the KV cache of ``StaticInferenceContext``) for the native-resolution vision-language
models (models/families/qwen2_vl/model.py).

megatron-core's ``GPTInferenceWrapper`` carries tokens, 2-D positions and a mask; two small subclasses carry the
rest, each request bringing its ``VisionPrompt`` (generate_prompts.py) as the attribute ``vision``:
- ``VisionGenerationController.prep_inference_input`` hands the batch's requests to the wrapper;
- ``VisionInferenceWrapper.prep_inference_input`` builds the M-RoPE positions ``[3, b, S]`` of every token the batch
  will hold (the prompt's, then continued as HF does while decoding) and, on the first pipeline stage, runs the
  vision tower once over all the batch's images; each forward step then merges the rows of the image
  placeholders inside its window into the token embeddings (``decoder_input``). The prefill covers the shortest
  prompt; a longer prompt's later placeholders (its images included) arrive in later steps, still merged.
- Positions: megatron-core's static KV cache keeps keys before rotation and rotates the whole cache each step
  with the rotary table's first ``end`` rows (``attention.py``: ``k_pos_emb[:sequence_end]``); a 1-D RoPE table
  covers every position, M-RoPE's is built from the positions it is given, so every step is given the positions
  of the whole sequence so far ``[3, b, :end]`` (the model reads positions only for the rotation).
Sampling is the controller's, as for text (greedy, temperature, top-k / top-p). TP: both towers split as in
training, logits gathered; PP: the tower on the first stage, positions on every stage.
May assume: what inference/engine.py assumes; the model is a ``NativeResolutionVLM`` (inside its wrappers); every request has
``vision``.
"""

from __future__ import annotations

from megatron.core.inference.model_inference_wrappers.gpt.gpt_inference_wrapper import GPTInferenceWrapper
from megatron.core.inference.text_generation_controllers.text_generation_controller import (
    TextGenerationController)
from megatron.core.inference.utils import get_attention_mask

from mtmegatron.inference.engine import Generation, Sampling, generate
from mtmegatron.tasks.qwen_vl.generate_prompts import (VisionPrompt, batch_positions, image_mask, merged_embeddings,
                                                 rows_in_window, vision_rows)


class VisionInferenceWrapper(GPTInferenceWrapper):
    """GPTInferenceWrapper with M-RoPE positions and image embeddings (module docstring)."""

    def prep_inference_input(self, prompts_tokens, requests=None):
        inference_input = super().prep_inference_input(prompts_tokens)
        prompts: list[VisionPrompt] = [r.vision for r in requests]
        assert len(prompts) == prompts_tokens.shape[0], "a padded static batch (CUDA graphs) is not supported"
        inference_input["position_ids"] = batch_positions(prompts, prompts_tokens.shape[1], prompts_tokens.device)
        rows = vision_rows(self.model, prompts, prompts_tokens.device)  # None past the first pipeline stage
        if rows is not None:
            inference_input["vision_rows"] = rows
            inference_input["vision_mask"] = image_mask(self.model, prompts_tokens,
                                                        [len(r.prompt_tokens) for r in requests])
        return inference_input

    def get_batch_for_context_window(self, inference_input, context_start_position, context_end_position):
        window = super().get_batch_for_context_window(inference_input, context_start_position,
                                                      context_end_position)
        window["position_ids"] = inference_input["position_ids"][:, :, :context_end_position]
        if "vision_rows" in inference_input:
            mask = inference_input["vision_mask"]
            window["vision_mask"] = mask[:, context_start_position:context_end_position]
            window["vision_rows"] = rows_in_window(inference_input["vision_rows"], mask, context_start_position,
                                                   context_end_position)
        return window

    def _forward(self, inference_input):
        tokens = inference_input["tokens"]
        extra = {}
        if inference_input.get("vision_rows") is not None and inference_input["vision_rows"].shape[0]:
            extra["decoder_input"] = merged_embeddings(self.model, tokens, inference_input["vision_rows"],
                                                       inference_input["vision_mask"])
        return self.model(tokens, inference_input["position_ids"], inference_input["attention_mask"],
                          inference_context=self.inference_context, runtime_gather_output=True, **extra)


class VisionGenerationController(TextGenerationController):
    """Hands each static batch's requests (their ``vision``) to ``VisionInferenceWrapper``."""

    def prep_inference_input(self, prompts_tokens, active_requests, use_attention_mask: bool = False):
        inference_input = self.inference_wrapped_model.prep_inference_input(prompts_tokens,
                                                                            list(active_requests.values()))
        if use_attention_mask and inference_input.get("attention_mask") is None:
            inference_input["attention_mask"] = get_attention_mask(prompts_tokens.size(1))
        return inference_input


def generate_with_images(model, tokenizer, prompts: list[str], prompt_tokens: list[list[int]],
                         visions: list[VisionPrompt], sampling: Sampling,
                         max_batch_size: int = 8) -> tuple[list[Generation], float]:
    """engine.generate with the vision wrapper/controller; ``visions[i]`` belongs to ``prompt_tokens[i]``."""
    return generate(model, tokenizer, prompts, prompt_tokens, sampling, max_batch_size,
                    wrapper_class=VisionInferenceWrapper, controller_class=VisionGenerationController,
                    request_extras=[{"vision": v} for v in visions])
