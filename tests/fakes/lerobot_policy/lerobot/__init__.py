"""A stand-in for LeRobot's policy API (0.4.x), for the tests of `hg-dagger policy serve lerobot:DIR` in this
environment, where LeRobot itself cannot be installed (it needs torch 2.14.1; tests/interop runs the real one).
Only what the server calls: ``lerobot.configs.policies.PreTrainedConfig.from_pretrained(dir)``,
``lerobot.policies.factory.get_policy_class(type).from_pretrained(dir, config=)`` and
``make_pre_post_processors(config, pretrained_path=dir, **overrides)``."""
