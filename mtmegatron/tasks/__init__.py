"""The kinds of run: what data a run reads, its forward step and loss, and what it leaves behind when it ends.
May assume: the training loop (training/) below it; entry points above it choose the task.
"""
