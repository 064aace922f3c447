"""What every layer shares and nothing else: an injectable clock, the backoff formula, throttled
and structured log lines, token buckets, histograms and task shutdown. Imports no other layer."""
