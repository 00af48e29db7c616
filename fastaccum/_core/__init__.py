"""What both twins share, written once: the per-stream rules, the messages, the dialect readers,
the base64 spans and the accumulator's once-per-stream base. It imports neither twin nor any
transport."""
