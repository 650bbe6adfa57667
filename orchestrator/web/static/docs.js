// Starts Swagger UI on /docs. A file of its own because the page's Content-Security-Policy allows no
// inline script; Swagger UI itself is served from the orchestrator (no CDN).
window.ui = SwaggerUIBundle({
  url: document.body.dataset.openapi,
  dom_id: "#swagger-ui",
  deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
