"""rlq.rl: the RL helpers every experiment shares (Gymnasium and Stable-Baselines3 glue).

- ``rlq.rl.envs``: environments by id (classic control, MuJoCo, Atari, DeepMind Control, football).
- ``rlq.rl.football``: Google Research Football as a Gymnasium environment.
- ``rlq.rl.agents``: SB3 models trained with checkpoints and resume, logging into a run folder.
- ``rlq.rl.episodes``: finished episodes read from SB3's per-step ``infos``.
- ``rlq.rl.evaluate``: seeded evaluation of any model, policy or function, and a random-policy floor.
- ``rlq.rl.seeding``: ``seed_everything``.
- ``rlq.rl.parallel``: independent jobs (training runs) in worker processes.

Nothing here imports the experiments machinery (``rlq.experiments``) or the faces (``rlq.faces``).
"""
