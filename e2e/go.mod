// The end-to-end tests are a module of their own, so that their browser
// driver (github.com/chromedp/chromedp) stays out of the build of a Caddy
// with the plugin. They build against this checkout of the plugin (the
// replace below) and start its Caddy with internal/harness.
module github.com/fair-queue/caddy-fair-queue/e2e

go 1.26.8

replace github.com/fair-queue/caddy-fair-queue => ../

require (
	github.com/chromedp/chromedp v0.23.1
	github.com/fair-queue/caddy-fair-queue v0.0.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/chromedp/cdproto v0.160.1 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
