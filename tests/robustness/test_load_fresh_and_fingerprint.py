"""``--load`` of the not yet created ``--save`` directory (Megatron-LM's ``--save X --load X`` first run) or
of an empty directory starts from scratch with a message, and no "loaded" line (the refusals of other
``--load`` directories: tests/test_bad_inputs.py). The model fingerprint (models/fingerprint.py): a
DeepSeek-V3 checkpoint loaded with another MLA dim gets the "different model" message naming the field, not
"damaged files"; old checkpoints that lack newer fingerprint keys still compare on the keys they have."""

from __future__ import annotations

from types import SimpleNamespace

from helpers.pretrain_runner import TINY, run_pretrain

from mtmegatron.models.fingerprint import FINGERPRINT_FIELDS, mismatches


def test_load_of_the_save_dir_on_the_first_run_or_an_empty_dir_starts_fresh(tmp_path):
    ckpt = tmp_path / "ckpt"  # missing: the first run of `--save X --load X`
    proc, rows = run_pretrain(1, TINY + ["--train-iters", "2", "--save", str(ckpt), "--load", str(ckpt)],
                              tmp_path / "first")
    assert "no such directory, no checkpoint to resume: starting from scratch at iteration 0" in proc.stdout
    assert "mtmegatron: loaded" not in proc.stdout
    assert [r["iteration"] for r in rows] == [1, 2] and (ckpt / "iter_0000002" / "metadata.json").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    proc, rows = run_pretrain(1, TINY + ["--train-iters", "1", "--load", str(empty)], tmp_path / "second")
    assert "empty directory, no checkpoint to resume" in proc.stdout and len(rows) == 1
    assert "mtmegatron: loaded" not in proc.stdout


def test_deepseek_checkpoint_with_another_mla_dim_is_a_model_mismatch(tmp_path):
    deepseek = ["--backend", "cpu", "--model", "deepseek-v3", "--mock-data", "--micro-batch-size", "1",
                "--global-batch-size", "1", "--log-interval", "100"]
    ckpt = tmp_path / "ckpt"
    run_pretrain(1, deepseek + ["--train-iters", "1", "--save", str(ckpt)], tmp_path / "a")
    proc, _ = run_pretrain(1, deepseek + ["--train-iters", "2", "--load", str(ckpt), "--kv-lora-rank", "8"],
                           tmp_path / "b", expect_ok=False)
    assert proc.returncode == 2
    assert "was written for a different model (kv_lora_rank: checkpoint 16 vs run 8)" in proc.stderr
    assert "damaged" not in proc.stderr


def test_fingerprint_covers_shape_and_math_flags_and_old_checkpoints_compare_present_keys():
    for field in ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
                  "moe_layer_freq", "num_experts", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                  "mtp_num_layers", "qk_layernorm", "position_embedding_type", "rotary_base", "rotary_scaling_factor",
                  "normalization", "swiglu", "untie_embeddings_and_output_weights", "padded_vocab_size",
                  "norm_epsilon"):
        assert field in FINGERPRINT_FIELDS, field
    run = SimpleNamespace(**{f: 1 for f in FINGERPRINT_FIELDS})
    old = {"num_layers": 1, "hidden_size": 1}  # a checkpoint from before the MLA keys were stored
    assert mismatches(old, run) == {}
    assert mismatches({"num_layers": 2, "q_lora_rank": 1}, run) == {"num_layers": (2, 1)}
    run.q_lora_rank = None  # --q-lora-rank 0 and "no q LoRA" are the same model
    assert mismatches({"q_lora_rank": 0}, run) == {}
