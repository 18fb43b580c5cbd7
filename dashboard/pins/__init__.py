"""The Checkpoints page's pins: a pin and a suggested junction in words and as a table
(`text`: the released pins, a write's outcome line, a prefix's last characters, the `prefix`
of `POST /pins` a pasted text becomes), the cards that show an active pin and a suggested
junction with their buttons (`cards`), and the writes those buttons and the pin form make with
the session's write token, their outcome kept across refreshes (`writes`)."""
