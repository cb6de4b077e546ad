"""What more than one model family uses, one floor below the families: a family module (or folder) imports only
gpt.py (the plain decoder every family builds on), base.py, this package and models/ below, never another family
(.importlinter's family independence contract). The naming rule: a piece every decoder family may use lives in
gpt.py; a piece a few families share lives here, in a module named by what it is (``qwen.py``: the Qwen lines'
config.json and presets; ``vision_encoder.py``: the vision-tower config pieces of the vision-language families),
not by the family it was first written for.
May assume: what gpt.py assumes; ``vision_encoder.py`` also megatron-core.
"""
