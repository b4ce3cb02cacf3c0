"""The Inductor pass: the unfused graph forms it matches and the fused custom ops it puts in their place."""
