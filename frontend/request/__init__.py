"""One generation request's path: its record, tokenize, admit, submit, stream, meter, log."""
