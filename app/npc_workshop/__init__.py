"""The NPC workshop's areas (app/npc_screen.py wires them): the character cards and the line form."""
