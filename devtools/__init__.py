"""Developer tooling, not part of the installed package: a Tello SDK emulator, network
namespaces that give each emulated drone its own address, and an emulated fleet launcher.
"""
