using Microsoft.AspNetCore.Http;
using Tern.Proxy.Configuration;
using Yarp.ReverseProxy.Model;

namespace Tern.Proxy.Listeners;

/// <summary>
/// On the plain-HTTP listener, redirects every request to HTTPS (308, method kept) unless its
/// route carries the metadata Tern.AllowPlainHttp=true.
/// </summary>
internal static class PlainHttpPolicy
{
    public static Task InvokeAsync(HttpContext context, RequestDelegate next)
    {
        var active = context.RequestServices.GetRequiredService<ActiveConfiguration>();
        if (context.Connection.LocalPort != active.Bound.HttpPort || AllowsPlainHttp(context))
        {
            return next(context);
        }

        var request = context.Request; // it has a Host (EdgeRequests)
        var redirectPort = active.Current.Settings.RedirectHttpsPort ?? active.Bound.HttpsPort;
        var port = redirectPort == 443 ? null : (int?)redirectPort;
        var host = port is null ? new HostString(request.Host.Host) : new HostString(request.Host.Host, port.Value);
        context.Response.StatusCode = StatusCodes.Status308PermanentRedirect;
        context.Response.Headers.Location = $"https://{host.ToUriComponent()}{request.PathBase.ToUriComponent()}{request.Path.ToUriComponent()}{request.QueryString.ToUriComponent()}";
        return Task.CompletedTask;
    }

    private static bool AllowsPlainHttp(HttpContext context)
    {
        var metadata = context.GetEndpoint()?.Metadata.GetMetadata<RouteModel>()?.Config.Metadata;
        return metadata is not null
            && metadata.TryGetValue(ReverseProxyValidator.AllowPlainHttpMetadata, out var value)
            && bool.TryParse(value, out var allowed) && allowed;
    }
}
