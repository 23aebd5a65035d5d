// How problems reach a person: one action group that e-mails the operator, and two
// metric alerts on the Service Bus namespace.
//
//  * Dead-lettered messages on any queue (split by queue, so the e-mail names it):
//    an order that could not be submitted after its deliveries, or expired unread;
//    an agent request or response that kept failing. Nothing in a dead-letter queue
//    is processed again without an operator.
//  * Active messages on the alerts queue: the app put an operator alert there (an
//    order ended in Error: a step gave up after MAX_FAILURES expired attempts and
//    cannot be undone, or an undo failed; docs/workflows.md).
//
// Both auto-resolve once the queue is drained (the operator CLI reads both).
//
// And two log search alerts on the app's own metrics in Application Insights
// (customMetrics; names in core/names.py, explained in docs/observability.md):
//
//  * Deadline misses, per step: the share of a step's attempts whose complete-by
//    passed (the supervisor reset the step or gave up on it) over 15 minutes. A remote
//    service that answers too slowly, or a host that keeps dying, shows here first.
//  * Compensations: the share of orders that ended Compensated (undone as a whole)
//    over an hour. A remote service that refuses more than usual shows here.
//
// Both need some traffic first (minimumVolume), so one unlucky order alone does not page.

param actionGroupName string
param tags object = {}
param location string = resourceGroup().location

@description('Operator e-mail address.')
param alertEmail string

param serviceBusNamespaceName string
param alertsQueueName string

@description('Application Insights component the app sends its metrics to.')
param applicationInsightsName string

@minValue(1)
@maxValue(100)
@description('Alert when more than this percentage of a step\'s attempts missed their deadline within 15 minutes.')
param deadlineMissPercent int = 5

@minValue(1)
@maxValue(100)
@description('Alert when more than this percentage of the orders that ended within an hour ended Compensated.')
param compensationPercent int = 10

@minValue(1)
@description('The rate alerts judge only this many attempts (deadline misses) or finished orders (compensations) or more.')
param minimumVolume int = 20

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusNamespaceName
}

resource applicationInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: applicationInsightsName
}

resource operators 'Microsoft.Insights/actionGroups@2022-04-01' = {
  name: actionGroupName
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'sas-ops'
    enabled: true
    emailReceivers: [
      {
        name: 'operator'
        emailAddress: alertEmail
        useCommonAlertSchema: true
      }
    ]
  }
}

resource deadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${serviceBusNamespaceName}-dead-letters'
  location: 'global'
  tags: tags
  properties: {
    description: 'A Service Bus queue has dead-lettered messages. Inspect them with the operator CLI; they are not retried by themselves.'
    severity: 2
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'DeadLetteredMessages'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          // One alert per queue: '*' splits the series by queue name.
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [
      {
        actionGroupId: operators.id
      }
    ]
  }
}

resource operatorAlerts 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: '${serviceBusNamespaceName}-operator-alerts'
  location: 'global'
  tags: tags
  properties: {
    description: 'The app raised an operator alert (an order ended in Error). Read it with the operator CLI; the order can be resubmitted.'
    severity: 1
    enabled: true
    scopes: [
      namespace.id
    ]
    evaluationFrequency: 'PT1M'
    windowSize: 'PT5M'
    autoMitigate: true
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          criterionType: 'StaticThresholdCriterion'
          name: 'OperatorAlerts'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'ActiveMessages'
          dimensions: [
            {
              name: 'EntityName'
              operator: 'Include'
              values: [
                alertsQueueName
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [
      {
        actionGroupId: operators.id
      }
    ]
  }
}

// Counters arrive as customMetrics rows, one per export interval, valueSum = the count
// in that interval; attributes are customDimensions (order.step, order.state, ...).
var deadlineMissQuery = format('''
customMetrics
| where name in ("steps.deadline_misses", "steps.claimed")
| extend step = tostring(customDimensions["order.step"])
| summarize misses = sumif(valueSum, name == "steps.deadline_misses"), attempts = sumif(valueSum, name == "steps.claimed") by step
| where attempts >= {0}
| extend missPercent = 100.0 * misses / attempts
''', minimumVolume)

var compensationQuery = format('''
customMetrics
| where name == "orders.closed"
| extend state = tostring(customDimensions["order.state"])
| summarize closed = sum(valueSum), compensated = sumif(valueSum, state == "Compensated")
| where closed >= {0}
| extend compensatedPercent = 100.0 * compensated / closed
''', minimumVolume)

resource deadlineMisses 'Microsoft.Insights/scheduledQueryRules@2021-08-01' = {
  name: '${applicationInsightsName}-deadline-misses'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Steps missing their deadline'
    description: 'More than ${deadlineMissPercent}% of a step\'s attempts passed their complete-by within 15 minutes (the supervisor reset them or gave up). Look at the step\'s remote service (slow answers, outages) and at the hosts; the workbook shows misses per step.'
    severity: 2
    enabled: true
    scopes: [
      applicationInsights.id
    ]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: deadlineMissQuery
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'missPercent'
          // One alert per step.
          dimensions: [
            {
              name: 'step'
              operator: 'Include'
              values: [
                '*'
              ]
            }
          ]
          operator: 'GreaterThan'
          threshold: deadlineMissPercent
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: [
        operators.id
      ]
    }
  }
}

resource compensations 'Microsoft.Insights/scheduledQueryRules@2021-08-01' = {
  name: '${applicationInsightsName}-compensations'
  location: location
  tags: tags
  kind: 'LogAlert'
  properties: {
    displayName: 'Orders being undone'
    description: 'More than ${compensationPercent}% of the orders that ended within an hour ended Compensated (a step was refused, or gave up, and the order was undone). The workbook shows compensations per step; ordersctl list --state Compensated shows the orders and why.'
    severity: 3
    enabled: true
    scopes: [
      applicationInsights.id
    ]
    evaluationFrequency: 'PT15M'
    windowSize: 'PT1H'
    autoMitigate: true
    criteria: {
      allOf: [
        {
          query: compensationQuery
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'compensatedPercent'
          operator: 'GreaterThan'
          threshold: compensationPercent
          failingPeriods: {
            numberOfEvaluationPeriods: 1
            minFailingPeriodsToAlert: 1
          }
        }
      ]
    }
    actions: {
      actionGroups: [
        operators.id
      ]
    }
  }
}

output actionGroupName string = operators.name
