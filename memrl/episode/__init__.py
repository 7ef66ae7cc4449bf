"""The episode pipeline: BatchInput → memory → prompt → rollout → reward → EpisodeTrajectory.

    from memrl.episode.build import build_runner           # EpisodeRunner from the root Config
    from memrl.episode.worker import CustomRolloutWorker   # local or Ray actors (episode.worker.use_ray)
    from memrl.episode.pipeline import run_episodes        # `memrl run`
    from memrl.episode.evaluate import evaluate_ablations  # `memrl eval`
    from memrl.episode.prompt import PromptBuilder         # target-turn prompts within a token budget

Submodules are imported on demand so that ``memrl.config`` (which imports ``memrl.episode.config``) stays light.
"""
