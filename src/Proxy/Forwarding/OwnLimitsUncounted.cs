using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.DependencyInjection;
using Yarp.ReverseProxy.Health;
using Yarp.ReverseProxy.Model;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// Keeps Tern's own open-file limit out of health checks. A request or an active probe that needed
/// a new upstream connection when Tern could open no more never reached its destination, yet YARP's
/// policies count it against the destination: one burst past the limit marked a healthy destination
/// unhealthy for its whole reactivation period, and `/readyz` then reported the cluster down. Such a
/// request or probe is counted neither way; every other one reaches the policy as before.
/// </summary>
/// <remarks>
/// <see cref="WrapRegistered"/> wraps the policies registered when it runs: YARP's, which it adds
/// as singletons by type (a passive and two active policies in YARP 2.1; none is disposable or
/// registered as anything else). A policy registered later is not wrapped, and a later
/// <c>TryAddEnumerable</c> of one of YARP's types would add it a second time, which YARP refuses at
/// start (two policies of one name): Tern registers none.
/// </remarks>
internal static class OwnLimitsUncounted
{
    /// <summary>Wraps every passive and active health policy registered so far (YARP's, after <c>AddReverseProxy</c>).</summary>
    public static void WrapRegistered(IServiceCollection services)
    {
        for (var i = 0; i < services.Count; i++)
        {
            var registered = services[i];
            if (registered.IsKeyedService)
            {
                continue;
            }

            if (registered.ServiceType == typeof(IPassiveHealthCheckPolicy))
            {
                services[i] = ServiceDescriptor.Singleton<IPassiveHealthCheckPolicy>(s => new Passive(Create<IPassiveHealthCheckPolicy>(s, registered)));
            }
            else if (registered.ServiceType == typeof(IActiveHealthCheckPolicy))
            {
                services[i] = ServiceDescriptor.Singleton<IActiveHealthCheckPolicy>(s => new Active(Create<IActiveHealthCheckPolicy>(s, registered)));
            }
        }
    }

    private static T Create<T>(IServiceProvider services, ServiceDescriptor registered)
        where T : class => registered switch
        {
            { ImplementationInstance: T instance } => instance,
            { ImplementationFactory: { } factory } => (T)factory(services),
            _ => (T)ActivatorUtilities.CreateInstance(services, registered.ImplementationType!),
        };

    private sealed class Passive(IPassiveHealthCheckPolicy policy) : IPassiveHealthCheckPolicy
    {
        public string Name => policy.Name;

        public void RequestProxied(HttpContext context, ClusterState cluster, DestinationState destination)
        {
            if (!ProxyErrorResponses.IsOwnFileLimit(context.GetForwarderErrorFeature()?.Exception))
            {
                policy.RequestProxied(context, cluster, destination);
            }
        }
    }

    private sealed class Active(IActiveHealthCheckPolicy policy) : IActiveHealthCheckPolicy
    {
        public string Name => policy.Name;

        public void ProbingCompleted(ClusterState cluster, IReadOnlyList<DestinationProbingResult> probingResults)
        {
            if (probingResults.Any(r => ProxyErrorResponses.IsOwnFileLimit(r.Exception)))
            {
                probingResults = [.. probingResults.Where(r => !ProxyErrorResponses.IsOwnFileLimit(r.Exception))];
            }

            policy.ProbingCompleted(cluster, probingResults);
        }
    }
}
