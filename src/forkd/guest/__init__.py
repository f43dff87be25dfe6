"""The guest side (agent/, stdlib only) and its host client, with the wire protocol they share."""
