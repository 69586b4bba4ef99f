"""hg-dagger device list | calibrate CONFIG | monitor CONFIG"""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("device", help="operator input devices: list, calibrate, monitor")
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


def _list(args) -> int:
    from hg_dagger.devices.tools import connected_devices

    lines = connected_devices()
    print("\n".join(lines) if lines else "no gamepad or SpaceMouse found")
    return 0


def _calibrate(args) -> int:
    from hg_dagger.devices import load_device_config
    from hg_dagger.devices.tools import calibrate

    cfg = load_device_config(args.config)
    options = {"center_s": args.center_s}
    if cfg.type == "gamepad":
        options["range_s"] = args.range_s
    calibrate(cfg, **options)
    return 0


def _monitor(args) -> int:
    from hg_dagger.devices import make_device
    from hg_dagger.devices.tools import monitor

    device = make_device(args.config)
    with device:
        monitor(device, seconds=args.seconds, hz=args.hz)
    return 0
