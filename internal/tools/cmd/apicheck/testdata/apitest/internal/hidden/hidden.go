// An internal package: not part of the API.
package hidden

func Exported() {}
