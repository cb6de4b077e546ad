"""A test stand-in for the emerging-optimizers package (v0.1.0 API), which the CI image cannot import.

megatron-core 0.16.1's ``optimizer/muon.py`` imports ``OrthogonalizedOptimizer``, ``get_muon_scale_factor`` and
``muon_utils.newton_schulz_tp`` from emerging-optimizers v0.1.0; every release imports triton (absent from CPU
torch) and PyPI's 0.3 needs Python >= 3.12. This stand-in has the same signatures and the same update rule
(momentum EMA, optional Nesterov, decoupled or L2 weight decay, quintic Newton-Schulz, the scale modes), so
megatron-core's own Muon path and mtmegatron's wiring run end to end in tests/optimizer/test_muon.py; it is put on
PYTHONPATH by that test only. With ``MUON_STAND_IN_RECORD=FILE`` the first step appends the values it was built
and called with (so the test sees that the --muon-* flags reached it) as JSON lines to FILE.
"""
