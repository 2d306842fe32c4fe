"""Engine and samplers: runs diffusion LMs on llama.cpp. No UI code lives here."""
