"""The ledger: the code whose one invariant is "every record of the input answered exactly once, with its own
answer, and nothing lost", whatever the input and whatever is killed.

- `store`: the SQLite file of a job; a stored (id, sample) is final (never replaced behind the code's back);
- `writer`: the one writer task, batched transactions, counted only once committed;
- `identity`: what ties an output folder to its input, and the resume position's check;
- `intake`: the input read against the store: which records are work, which are done, which are bad input
  (duplicates decided over the whole input, the first occurrence owning its id);
- `jobmeta`: the meta rows a job keeps current for the next run and its readers.
"""
