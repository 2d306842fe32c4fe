"""The Models screen's areas (app/models_screen.py wires them): the text it shows about this machine
and a file to import, the line naming the app's server, and the actions on the selected row."""
