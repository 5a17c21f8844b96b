// Package e2e holds the browser tests of pglease: the status page of
// `pglease serve` driven in headless Chromium (Debian's `chromium` package)
// through chromedp. chromedp is a test requirement of the CLI's module, never
// of the library's.
//
// Run from this directory: go test -race ./...
// To refresh the README's screenshot: go test -run StatusPage -screenshot ../docs/status-page.png
package e2e
