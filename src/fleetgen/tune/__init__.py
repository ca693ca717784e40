"""`fleetgen tune`: candidate settings measured on the fleet's own GPUs with the job's own requests.

`classes` groups instances by GPU class, `search` plans rounds under a budget and narrows in, `verdict`
picks per class and prices the whole job, `fleetfile` writes the derived and the tuned fleet files,
`measure` launches one candidate through `up` and reads its steady state, `session` runs it all.
"""
