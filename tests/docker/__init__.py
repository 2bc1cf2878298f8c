"""Checks of docker/'s files that the compose tier cannot run."""
