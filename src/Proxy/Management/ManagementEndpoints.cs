using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.Hosting;
using Yarp.ReverseProxy;
using Yarp.ReverseProxy.Model;

namespace Tern.Proxy.Management;

/// <summary>
/// The management listener's endpoints: /healthz (the process serves), /readyz (configuration
/// loaded and every cluster has a destination not known to be down) and /metrics (Prometheus).
/// Served only on Tern:Management:Port; the public listeners never answer them.
/// </summary>
internal static class ManagementEndpoints
{
    public static Task HandleAsync(HttpContext context)
    {
        var response = context.Response;
        response.ContentType = "text/plain; charset=utf-8";
        response.Headers.CacheControl = "no-store";
        if (context.Request.Method is not ("GET" or "HEAD"))
        {
            // Probes and scrapers read; nothing here takes a POST, a DELETE or a TRACE. Methods are
            // case-sensitive: "head" is not HEAD (Kestrel would send it a body).
            response.StatusCode = StatusCodes.Status405MethodNotAllowed;
            response.Headers.Allow = "GET, HEAD";
            return Text(response, "method not allowed: the management port answers GET and HEAD\n");
        }

        switch (context.Request.Path.Value)
        {
            case "/healthz":
                return Text(response, "ok\n");
            case "/metrics":
                return context.RequestServices.GetRequiredService<Telemetry.MetricsEndpoint>().WriteAsync(context);
            case "/readyz":
                var problem = Unready(context.RequestServices);
                response.StatusCode = problem is null ? StatusCodes.Status200OK : StatusCodes.Status503ServiceUnavailable;
                return Text(response, problem is null ? "ready\n" : $"not ready: {problem}\n");
            default:
                response.StatusCode = StatusCodes.Status404NotFound;
                return Text(response, "not found: the management port serves /healthz, /readyz and /metrics\n");
        }
    }

    /// <summary>
    /// A short answer with its length: Kestrel sends headers and body in one write, where an
    /// answer of unknown length is chunked and its last chunk goes out in a second write.
    /// </summary>
    private static Task Text(HttpResponse response, string text)
    {
        response.ContentLength = System.Text.Encoding.UTF8.GetByteCount(text);
        return response.WriteAsync(text);
    }

    /// <summary>Why the proxy is not ready, or null when it is.</summary>
    internal static string? Unready(IServiceProvider services)
    {
        var lifetime = services.GetRequiredService<IHostApplicationLifetime>();
        if (!lifetime.ApplicationStarted.IsCancellationRequested)
        {
            return "starting";
        }

        if (lifetime.ApplicationStopping.IsCancellationRequested)
        {
            return "shutting down";
        }

        foreach (var cluster in services.GetRequiredService<IProxyStateLookup>().GetClusters())
        {
            var destinations = cluster.Destinations.Values;
            if (!destinations.Any(d => d.Health.Active != DestinationHealth.Unhealthy && d.Health.Passive != DestinationHealth.Unhealthy))
            {
                return $"cluster '{cluster.ClusterId}' has no destination that is up";
            }
        }

        return null;
    }
}
