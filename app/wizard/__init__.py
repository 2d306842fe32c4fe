"""The first-run wizard: shown instead of the chat when there is no config file yet.

One small screen (`screen.WizardScreen`) shows one step widget at a time in a ContentSwitcher, with
the step line above and the button bar (`nav.WizardNav`) below. Each step is its own module and
widget; the screen hands a step what it needs when it shows it, asks it what the bar offers
(`step.NavPlan`) and passes Next on to it, and a step answers with messages (`messages.py`), never by
reaching into another step:

    1 Welcome    welcome.py      what dgchat is, and the promise: after setup nothing leaves this machine
    2 Machine    hardware.py     cores, RAM, free disk, GPU offload, VRAM, each correctable (kept in
                                 hardware.toml); this machine's speed (speed.py): the saved profile or a
                                 few seconds of measuring in a worker
    3 Model      model_choice.py the catalog with fit badges and predicted answer times, the
                                 recommendation preselected; "Use a server…" opens server.py's form
    4 Download   download.py     asked first; progress, Cancel/Resume, sha256, a token for a gated repo,
                                 a checkpoint's conversion
    5 Ready      ready.py        the model loads and answers a short test on the live canvas; "Start
                                 chatting" writes the config and hands the loaded model to the chat

The only network traffic is the download the user starts in step 4 (or the server the user names);
everything else reads local files. This package's __init__ imports nothing, so that a step module
importing `messages` does not load the screen (no import cycle).
"""
