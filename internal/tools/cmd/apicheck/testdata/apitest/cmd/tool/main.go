// A main package: not part of the API.
package main

func Exported() {}

func main() {}
