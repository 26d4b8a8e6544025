"""The README's study summaries: each study writes its block between its own pair of markers."""


def write_between_markers(path: str, begin: str, end: str, block: str) -> None:
  """Replaces `begin` ... `end` (the markers included) in the file `path` with `block`, which
  starts with `begin` and ends with `end`; a file without both markers is left as it is and
  stops the program with one line."""
  with open(path) as f:
    text = f.read()
  if begin not in text or end not in text:
    raise SystemExit(f"{path}: no '{begin}' ... '{end}' markers to write between.")
  head, rest = text.split(begin, 1)
  with open(path, "w") as f:
    f.write(head + block + rest.split(end, 1)[1])
