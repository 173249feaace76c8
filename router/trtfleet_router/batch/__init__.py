"""The router's side of batches: lines run through its own OpenAI dispatch path, admitted by its load view
(the runner, store and records are :mod:`trtfleet.batch`)."""
