using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.DependencyInjection;
using Yarp.ReverseProxy.Health;
using Yarp.ReverseProxy.Model;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// Keeps Tern's own open-file limit out of passive health checks. A request that needed a new
/// upstream connection when Tern could open no more files never reached its destination, yet YARP's
/// failure-rate policy counts every forwarding error against the destination: one burst past the
/// limit marked a healthy destination unhealthy for its whole reactivation period, and `/readyz`
/// then reported the cluster down. Such a request is counted neither way; every other request
/// reaches the policy as before.
/// </summary>
internal sealed class OwnLimitsUncounted(IPassiveHealthCheckPolicy policy) : IPassiveHealthCheckPolicy
{
    public string Name => policy.Name;

    public void RequestProxied(HttpContext context, ClusterState cluster, DestinationState destination)
    {
        if (!ProxyErrorResponses.IsOwnFileLimit(context.GetForwarderErrorFeature()?.Exception))
        {
            policy.RequestProxied(context, cluster, destination);
        }
    }

    /// <summary>Wraps every passive health policy registered so far (YARP's, after <c>AddReverseProxy</c>).</summary>
    public static void WrapRegistered(IServiceCollection services)
    {
        for (var i = 0; i < services.Count; i++)
        {
            var registered = services[i];
            if (registered.ServiceType != typeof(IPassiveHealthCheckPolicy) || registered.IsKeyedService)
            {
                continue;
            }

            services[i] = ServiceDescriptor.Singleton<IPassiveHealthCheckPolicy>(s => new OwnLimitsUncounted(registered switch
            {
                { ImplementationInstance: IPassiveHealthCheckPolicy instance } => instance,
                { ImplementationFactory: { } factory } => (IPassiveHealthCheckPolicy)factory(s),
                _ => (IPassiveHealthCheckPolicy)ActivatorUtilities.CreateInstance(s, registered.ImplementationType!),
            }));
        }
    }
}
