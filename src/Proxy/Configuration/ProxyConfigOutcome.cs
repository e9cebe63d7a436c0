using Yarp.ReverseProxy.Configuration;

namespace Tern.Proxy.Configuration;

/// <summary>
/// Hears whether YARP accepted the routes and clusters the gate last published, so that a reload
/// YARP rejects (a bad match pattern, an unknown policy) is reported and rolled back like any
/// other invalid configuration instead of being announced as applied.
/// </summary>
internal sealed class ProxyConfigOutcome : IConfigChangeListener
{
    private TaskCompletionSource<Exception?> _next = NewSource();

    /// <summary>Call before publishing; then wait on the returned task for YARP's verdict.</summary>
    public Task<Exception?> Expect() => (_next = NewSource()).Task;

    public void ConfigurationLoadingFailed(IProxyConfigProvider configProvider, Exception exception) => _next.TrySetResult(exception);

    public void ConfigurationLoaded(IReadOnlyList<IProxyConfig> proxyConfigs)
    {
    }

    public void ConfigurationApplyingFailed(IReadOnlyList<IProxyConfig> proxyConfigs, Exception exception) => _next.TrySetResult(exception);

    public void ConfigurationApplied(IReadOnlyList<IProxyConfig> proxyConfigs) => _next.TrySetResult(null);

    /// <summary>YARP's reasons, one per problem, for logs that name the section.</summary>
    public static IEnumerable<string> Reasons(Exception exception) =>
        exception is AggregateException aggregate ? aggregate.Flatten().InnerExceptions.Select(e => e.Message)
        : exception.InnerException is AggregateException inner ? Reasons(inner)
        : [exception.Message];

    private static TaskCompletionSource<Exception?> NewSource() => new(TaskCreationOptions.RunContinuationsAsynchronously);
}
