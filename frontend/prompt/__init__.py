"""What the model reads: the tokenizer (the vocabulary, through llama.cpp) and the chat
template that turns a conversation into a prompt."""
