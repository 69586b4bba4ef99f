"""The desktop application (installed as hg_dagger.ui): operator console and review workspace. Nothing imports ui.

The views read ``hg_dagger.control.live`` snapshots and send its commands; they never call the session.
They share the CPU with the control loop, so each redraws only what changed (see plots and view).

    main_window   MainWindow: the operator console assembled; HelpDialog
    start_dialog  StartDialog -> StartChoices (plain dataclass): operator, task, backend, student, store
    snapshots     SnapshotReader: newest Snapshot from a LatestSlot on a QTimer
    view          LiveView: the camera frame
    plots         GatePlot, ProgressPlot, ActionPlots (ring buffers keyed by seq; y ranges fixed or
                  GrowingRange, never auto-ranged per frame, so a frame redraws little but the curves)
    gate          GateLight, HandoverBanner
    controls      EStopPanel, EpisodeControls (mode selector included)
    device_panel  DevicePanel (hot-plug list, live axes), CalibrationDialog
    health        LoopHealthPanel
    rounds        RoundsPanel, StatusLine
    keys          KeyboardBridge: window keys -> KeyEvent / EStop / ReleaseKeys
    style         what each colour means
    settings      AppSettings (pydantic) in app.yaml of the config home: a bad value is one warning, its default
"""
