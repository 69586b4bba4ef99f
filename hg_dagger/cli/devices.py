"""hg-dagger device list | calibrate CONFIG | monitor CONFIG | keys [CONFIG]"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("device", help="operator input devices: list, calibrate, monitor, keys")
    dsub = p.add_subparsers(dest="device_command", metavar="ACTION", required=True)
    ls = dsub.add_parser("list", help="gamepads and SpaceMice currently connected")
    ls.set_defaults(func=_list)
    cal = dsub.add_parser("calibrate", help="measure centers/ranges and save them for this device")
    cal.add_argument("config", help="device config file, or a name in configs/devices (gamepad, spacemouse)")
    cal.add_argument("--center-s", type=float, default=2.0, help="hands-off phase, seconds")
    cal.add_argument("--range-s", type=float, default=6.0, help="full-travel phase (gamepad), seconds")
    cal.set_defaults(func=_calibrate)
    mon = dsub.add_parser("monitor", help="print the device's commands live")
    mon.add_argument("config")
    mon.add_argument("--seconds", type=float, default=10.0)
    mon.add_argument("--hz", type=float, default=25.0)
    mon.set_defaults(func=_monitor)
    keys = dsub.add_parser("keys", help="the in-window keyboard's keys and what they do")
    keys.add_argument("config", nargs="?", default="keyboard", help="keyboard config file or name (default: keyboard)")
    keys.set_defaults(func=_keys)


def _list(args) -> int:
    # deferred: the devices load for a device command only; the other commands run without them (tests/learn/test_eval.py)
    from hg_dagger.devices.tools import connected_devices

    lines = connected_devices()
    print("\n".join(lines) if lines else "no gamepad or SpaceMouse found")
    return 0


def _calibrate(args) -> int:
    # deferred: the devices load for a device command only; the other commands run without them (tests/learn/test_eval.py)
    from hg_dagger.devices import load_device_config
    from hg_dagger.devices.tools import calibrate

    cfg = load_device_config(args.config)
    options = {"center_s": args.center_s}
    if cfg.type == "gamepad":
        options["range_s"] = args.range_s
    calibrate(cfg, **options)
    return 0


def _monitor(args) -> int:
    # deferred: the devices load for a device command only; the other commands run without them (tests/learn/test_eval.py)
    from hg_dagger.devices import make_device
    from hg_dagger.devices.tools import monitor

    device = make_device(args.config)
    with device:
        monitor(device, seconds=args.seconds, hz=args.hz)
    return 0


def _keys(args) -> int:
    # deferred: the devices load for a device command only; the other commands run without them (tests/learn/test_eval.py)
    from hg_dagger.devices import KeyboardConfig, key_layout, load_device_config
    from hg_dagger.devices.base import DeviceError

    cfg = load_device_config(args.config)
    if not isinstance(cfg, KeyboardConfig):
        raise DeviceError(f"{args.config}: a keyboard config is needed, this one is type {cfg.type!r}")
    rows = key_layout(cfg)
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {meaning}" for k, meaning in rows))
    return 0
