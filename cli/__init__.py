"""The `attnzoo` command line: the entry point (`entry`), the parser and the exit-code rule
(`main`), one module per command group (`cmd_zoo`, `cmd_onnx`, `cmd_bench`, `cmd_heads`,
`cmd_serve`). It may import every package of attnzoo; none of them imports it."""
